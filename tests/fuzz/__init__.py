"""The in-project fuzzer (issue 10): every public op of :mod:`cudnnkit.ops` and the graph API, called as a careless
or hostile user would, from one description per op.

* :mod:`.specs`: the table of op descriptions (``SPECS``): how to make a valid call, the domains of its arguments,
  and a float64 NumPy reference for the result. This moves onto the primitive registry in ``src`` with the
  structure issue.
* :mod:`.strategies`: Hypothesis strategies over shapes, dtypes, strides, non-arrays, parameters, streams and
  pointers, and the case generator that mutates one aspect of a valid call (``case_strategy``,
  :func:`.strategies.generate`, a seeded generator over the same definitions for the GPU tier).
* :mod:`.model`: a case is pure data (library-neutral, picklable); :mod:`.materialize` turns it into arrays of a
  backend: fake device arrays on the CPU (with a gate that stops every call at the device), CuPy or torch arrays.
* :mod:`.outcome`: what counts as a clear refusal, an unclear error, a wrong result.
* :mod:`.runner`: runs cases in this process (CPU tier) or in a long-lived worker subprocess that syncs and runs a
  sanity op after each case and is restarted when it dies (GPU tier, ``scripts/fuzz``).
* :mod:`.emulate`: independent CPU implementations (torch in float64) that the CPU tier holds the GPU tier's
  references and checks against, so a wrong reference shows without a GPU.
"""
