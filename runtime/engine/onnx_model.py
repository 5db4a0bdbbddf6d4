"""Reading what an ONNX file needs to run: its real input, a fixed input shape, a hash.

Real models are messy: initializers listed as graph inputs (old exporters), symbolic
dimensions, several opsets. This module finds the one real input and fixes its shape.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported where a model is parsed: onnx costs ~18 MB and ~2 s to import,
    import onnx  # and a daemon serving on ONNX Runtime from a manifest never parses one


class ModelError(ValueError):
    """A model file cannot be used; the message names the file and the cause."""


@dataclass(frozen=True)
class ModelInput:
    """The single image input of a model, with every dimension fixed."""

    name: str
    shape: tuple[int, ...]
    declared: tuple[int | str, ...]  # as the file declares it (str = symbolic)


def load_onnx(path: Path) -> onnx.ModelProto:
    """Parse an ONNX file, turning every parse failure into a ModelError naming it."""
    import onnx
    from google.protobuf.message import DecodeError

    try:
        data = path.read_bytes()
    except OSError as e:
        raise ModelError(f"{path}: cannot read model file ({e.strerror or e})") from e
    try:
        model = onnx.load_from_string(data)
    except (DecodeError, ValueError, RuntimeError) as e:
        raise ModelError(
            f"{path}: not a valid ONNX model ({len(data)} bytes; truncated or corrupt?): {e}"
        ) from e
    if not model.graph.node:
        raise ModelError(f"{path}: ONNX file has an empty graph (truncated or corrupt?)")
    return model


def _declared_dims(value_info: onnx.ValueInfoProto) -> tuple[int | str, ...]:
    dims: list[int | str] = []
    for d in value_info.type.tensor_type.shape.dim:
        if d.HasField("dim_value") and d.dim_value > 0:
            dims.append(d.dim_value)
        else:
            dims.append(d.dim_param or "?")
    return tuple(dims)


def model_input(model: onnx.ModelProto, path: Path, override: tuple[int, ...] = ()) -> ModelInput:
    """The one real input of `model`, its shape fixed by `override` or by the file.

    A symbolic leading (batch) dimension becomes 1; any other symbolic dimension needs
    `override` (config `model.input_shape` or `--input-shape`).
    """
    inits = {i.name for i in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in inits]
    if len(inputs) != 1:
        names = ", ".join(i.name for i in inputs) or "none"
        raise ModelError(f"{path}: expected exactly one image input, found {len(inputs)}: {names}")
    inp = inputs[0]
    declared = _declared_dims(inp)
    if override:
        if len(override) != len(declared):
            raise ModelError(
                f"{path}: input '{inp.name}' has rank {len(declared)} {list(declared)}, "
                f"but the configured input_shape {list(override)} has rank {len(override)}"
            )
        for want, have in zip(override, declared, strict=True):
            if isinstance(have, int) and have != want:
                raise ModelError(
                    f"{path}: input '{inp.name}' is fixed at {list(declared)} in the file; "
                    f"configured input_shape {list(override)} contradicts it"
                )
        return ModelInput(inp.name, tuple(override), declared)
    shape = list(declared)
    if shape and isinstance(shape[0], str):
        shape[0] = 1
    dynamic = [i for i, d in enumerate(shape) if isinstance(d, str)]
    if dynamic:
        raise ModelError(
            f"{path}: input '{inp.name}' has dynamic dimensions {list(declared)}; "
            "fix them with model.input_shape in the config or --input-shape, e.g. 1,3,224,224"
        )
    return ModelInput(inp.name, tuple(int(d) for d in shape), declared)


def with_fixed_input(model: onnx.ModelProto, inp: ModelInput) -> bytes:
    """Serialized copy of `model` whose input dims are `inp.shape` (for engines that need it)."""
    if all(isinstance(d, int) for d in inp.declared):
        return model.SerializeToString()
    fixed = type(model)()
    fixed.CopyFrom(model)
    for vi in fixed.graph.input:
        if vi.name == inp.name:
            for dim, size in zip(vi.type.tensor_type.shape.dim, inp.shape, strict=True):
                dim.Clear()
                dim.dim_value = size
    return fixed.SerializeToString()


def file_sha256(path: Path) -> str:
    """sha256 of a file, streamed."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
