"""Steps 2 and 3: fp16, and static QDQ int8 (a classifier's in one go; a detector's
candidates for runtime/engine/int8_search.py).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from runtime.engine.prepare.errors import StepError
from runtime.engine.prepare.session import cpu_session


def make_fp16(src: Path, dst: Path) -> None:
    """Step 2."""
    from onnxruntime.transformers.float16 import convert_float_to_float16

    model = convert_float_to_float16(onnx.load(str(src)), keep_io_types=True)
    onnx.save(model, str(dst))


def _reader(batches: Callable[[], Iterator[np.ndarray]], input_name: str) -> Any:
    """ORT's calibration feed over `batches()` (one pass), as its quantizer asks for it."""
    from onnxruntime.quantization import CalibrationDataReader

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self._it = batches()

        def get_next(self):
            x = next(self._it, None)
            return None if x is None else {input_name: x}

    return Reader()


def make_int8(src: Path, dst: Path, batches: Callable[[], Iterator[np.ndarray]],
              input_name: str) -> list[str]:
    """Step 3; returns warnings. ORT's pre-processing optimises the graph first; some of its
    fusions quantize into invalid graphs (a DequantizeLinear over an int32 fused bias, seen on
    a PaddlePaddle export), so an int8 model that does not load is rebuilt without them."""
    from onnxruntime.quantization import (
        QuantFormat,
        QuantType,
        quant_pre_process,
        quantize_static,
    )

    warnings: list[str] = []
    import importlib.util

    # symbolic shape inference imports sympy (a dependency of edgerun): when an
    # install lacks it, that pass is skipped on purpose, said once, not tried and warned about
    symbolic = importlib.util.find_spec("sympy") is not None
    if not symbolic:
        warnings.append("int8: sympy is not installed, so ORT's symbolic shape inference is "
                        "skipped (pip install sympy; it is in edgerun's dependencies)")
    with tempfile.TemporaryDirectory() as tmp:
        for skip_opt in (False, True):
            pre = Path(tmp) / f"pre{int(skip_opt)}.onnx"
            try:
                quant_pre_process(str(src), str(pre), skip_optimization=skip_opt,
                                  skip_symbolic_shape=not symbolic)
            except Exception as e:
                warnings.append(f"int8: symbolic shape inference failed ({type(e).__name__}: "
                                f"{e}); skipped it")
                try:
                    quant_pre_process(str(src), str(pre), skip_optimization=skip_opt,
                                      skip_symbolic_shape=True)
                except Exception:
                    shutil.copy(src, pre)
            quantize_static(str(pre), str(dst), _reader(batches, input_name),
                            quant_format=QuantFormat.QDQ, per_channel=True,
                            activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
            try:
                cpu_session(dst)
                return warnings
            except Exception as e:
                why = str(e).splitlines()[0][:200]
                if skip_opt:
                    raise StepError("int8", f"the quantized graph does not load: {why}") from e
                warnings.append(f"int8: quantizing the ORT-optimised graph gave an invalid model "
                                f"({why}); rebuilt without pre-quantization optimisation")
    return warnings


def int8_base(src: Path, dst: Path) -> list[str]:
    """ORT's pre-quantization processing of `src` into `dst`, every node named (the int8
    search excludes nodes by name); returns warnings."""
    import importlib.util

    from onnxruntime.quantization import quant_pre_process

    from runtime.engine.int8_search import name_nodes

    warnings: list[str] = []
    symbolic = importlib.util.find_spec("sympy") is not None
    if not symbolic:
        warnings.append("int8: sympy is not installed, so ORT's symbolic shape inference is "
                        "skipped (pip install sympy; it is in edgerun's dependencies)")
    try:
        quant_pre_process(str(src), str(dst), skip_symbolic_shape=not symbolic)
    except Exception as e:
        warnings.append(f"int8: ORT's pre-processing failed ({type(e).__name__}: {e}); "
                        "quantizing the graph as it is")
        shutil.copy(src, dst)
    proto = onnx.load(str(dst))
    if name_nodes(proto):
        onnx.save(proto, str(dst))
    return warnings


def quantize_to(pre: Path, dst: Path, batches: Callable[[], Iterator[np.ndarray]],
                input_name: str, exclude: list[str], method: str) -> None:
    """Static QDQ int8 of `pre` (from int8_base) into `dst`: per-channel weights, `exclude`d
    nodes left in float, calibrated by `method` (MinMax | Percentile | Entropy); raises
    StepError when the result does not load."""
    import contextlib
    import io

    from onnxruntime.quantization import (
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    with contextlib.redirect_stdout(io.StringIO()):  # the calibrators print their progress
        quantize_static(str(pre), str(dst), _reader(batches, input_name),
                        quant_format=QuantFormat.QDQ, per_channel=True,
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                        nodes_to_exclude=list(exclude),
                        calibrate_method=getattr(CalibrationMethod, method))
    try:
        cpu_session(dst)
    except Exception as e:
        raise StepError("int8", f"the quantized graph does not load: "
                        f"{str(e).splitlines()[0][:200]}") from e
