"""Sphinx configuration of the cudnnkit documentation (docs/README.md says why Sphinx, MyST and autodoc)."""

from __future__ import annotations

import os
import sys

# The package from this checkout (an editable install finds it too; this makes a plain checkout work).
sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "src")))

import cudnnkit  # noqa: E402

project = "cudnnkit"
author = "the cudnnkit authors"
copyright = "the cudnnkit authors, Apache License 2.0"
release = cudnnkit.__version__
version = release

extensions = [
    "myst_parser",  # the pages are Markdown (MyST)
    "sphinx.ext.autodoc",  # the API reference, from the docstrings
    "sphinx.ext.napoleon",  # Google-style sections (Args:, Returns:, Example:) in the docstrings
    "sphinx.ext.viewcode",
]

source_suffix = {".md": "markdown"}
exclude_patterns = ["_build", "README.md"]
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

# autodoc: every name in each module's __all__, in source order; type hints in the parameter lists (signatures stay
# short), the defaults as written. cudnnkit.torch and cudnnkit.jax import torch and jax: the docs build installs
# their CPU builds (.ci/run step 2b) rather than mocking them, so their pages show the real objects.
autodoc_default_options = {"members": True, "member-order": "bysource", "show-inheritance": True}
autodoc_typehints = "description"
autodoc_typehints_format = "short"
autodoc_preserve_defaults = True
autodoc_class_signature = "mixed"
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False

# Docstrings across the package use :data:/:func:/:class: roles for private helpers too; those have no page.
nitpicky = False

html_theme = "furo"
html_title = f"cudnnkit {release}"
html_static_path: list[str] = []
