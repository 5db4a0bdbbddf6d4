"""A backend plugin whose kernels the real OpenCL driver refuses: edgerun's own kernel source
with one line that does not compile appended, built on the real devices. What a device whose
compiler cannot build the kernels looks like (pip's pocl on a CPU its LLVM does not know)."""

from __future__ import annotations

from runtime.engine.backends.opencl import OpenClBackend, kernel_source

BROKEN_LINE = "__kernel void refused(__global float *x) { x[0] = undeclared_thing; }"


class RefusingOpenCl(OpenClBackend):
    """OpenCL with a kernel source every driver rejects (`undeclared_thing`)."""

    def __init__(self) -> None:
        super().__init__(kernel_source=kernel_source() + "\n" + BROKEN_LINE + "\n")
