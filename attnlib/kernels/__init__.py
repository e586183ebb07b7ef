"""Triton kernels. Imported lazily by the public ops, never by ``import attnlib``, so that
``TRITON_INTERPRET=1`` set before attnlib's import is what the ``@triton.jit`` decorators see."""
