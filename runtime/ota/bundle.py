"""Signed model bundles: one tar file carrying a prepared model directory, verified on arrival.

Layout (an uncompressed tar: ONNX weights do not compress, and a plain tar can be verified
while it streams to disk):

    edgerun-bundle.json   the signed header: schema, model name, version, and every file's
                          name, size and sha256 (manifest.json first)
    edgerun-bundle.sig    {"key_id": ..., "sig": base64 Ed25519 over the header's exact bytes}
    manifest.json         the model's manifest (docs/manifest.md), itself listing each
                          variant's sha256
    <variant files>

A device trusts the publisher keys of `[models] publisher_keys` (a trust set of its own, apart
from the command keys). `unpack` refuses, with the reason, a bundle that is unsigned, signed by
a key not in that set, signed wrongly, carries a file whose bytes differ from the signed list,
lacks a listed file (truncated), or carries anything else (links, paths, extra files). Nothing
it refuses is left on disk.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import tarfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from runtime.durable import fsync_dir
from runtime.engine.manifest import MANIFEST, hashed_files, load_manifest
from runtime.engine.onnx_model import ModelError, file_sha256
from runtime.wire.commands import key_id

SCHEMA = "edgerun.bundle/1"
HEADER = "edgerun-bundle.json"
SIG = "edgerun-bundle.sig"
SUFFIX = ".edgerun"
MAX_HEADER = 1 << 20  # a header listing a few hundred files is a few KB
_FILE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")  # flat names only: no paths
# A model name and a version become one directory name, `name@version`, in the device's model
# store and the coordinator's shelf: a single plain path component (fullmatch: `$` alone lets a
# trailing newline through), no separator, no `..`, bounded. The one rule both sides apply.
NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
VERSION = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]{0,63}")
CHUNK = 1 << 16


class BundleError(Exception):
    """A bundle was refused; the message says why (shown to the operator and in events)."""


@dataclass(frozen=True)
class BundleInfo:
    """What a verified bundle's signed header says."""

    name: str
    version: str
    key_id: str
    files: tuple[dict[str, Any], ...]  # {"name", "size", "sha256"}, manifest.json first
    created: float

    @property
    def id(self) -> str:
        """`name@version`: the model store's directory name."""
        return f"{self.name}@{self.version}"

    @property
    def size(self) -> int:
        """Bytes of the files it carries."""
        return sum(f["size"] for f in self.files)


def check_name(name: Any) -> str:
    """A model name safe as part of a directory name; BundleError otherwise."""
    if not isinstance(name, str) or not NAME.fullmatch(name) or ".." in name:
        raise BundleError(f"model name must be 1-128 characters of A-Z a-z 0-9 _ . - (not "
                          f"starting with . or -, no '..'), got {str(name)[:160]!r}")
    return name


def check_version(version: Any) -> str:
    """A version string safe as part of a directory name; BundleError otherwise."""
    if not isinstance(version, str) or not VERSION.fullmatch(version) or ".." in version:
        raise BundleError(f"version must be 1-64 characters of A-Z a-z 0-9 _ . + - "
                          f"(not starting with . + -, no '..'), got {str(version)[:100]!r}")
    return version


def model_id(name: Any, version: Any) -> str:
    """`name@version` after both are checked (check_name, check_version): the directory name
    a version gets on a device and on the coordinator's shelf. BundleError otherwise."""
    return f"{check_name(name)}@{check_version(version)}"


def parse_id(vid: Any) -> tuple[str, str]:
    """(name, version) of a `name@version` string, both checked; BundleError otherwise."""
    if not isinstance(vid, str) or vid.count("@") != 1:
        raise BundleError(f"not a model version id (name@version): {str(vid)[:200]!r}")
    name, version = vid.split("@")
    return check_name(name), check_version(version)


def inside(root: Path, name: str) -> Path:
    """`root / name` when it resolves to a path strictly inside `root` (links followed);
    BundleError otherwise. Every directory an install writes goes through this."""
    base = root.resolve()
    p = (root / name).resolve()
    if p == base or not p.is_relative_to(base):
        raise BundleError(f"{root / name} is not inside {base}: refused")
    return p


def make(model_dir: str | Path, key: Ed25519PrivateKey, out: str | Path,
         version: str = "") -> BundleInfo:
    """Pack a prepared model directory (its manifest and the variant files it lists) into a
    signed bundle at `out`, with the eval images and side files the manifest names with a
    hash. Every one of them is sha256-checked against the manifest first, so a
    corrupt directory is never signed. `version` defaults to the manifest's sha256 (12 hex)."""
    model_dir = Path(model_dir)
    manifest = load_manifest(model_dir)  # ModelError naming the file when it is not one
    names = [MANIFEST] + [v.file for v in manifest.variants]
    # the kept val images engines measure their own precisions on (docs/manifest.md `eval`)
    # and every other file the manifest names with a hash (side files), when present
    hashed = hashed_files(model_dir)
    names += [f for _, f, _ in hashed if _FILE.match(f) and (model_dir / f).is_file()]
    for v in manifest.variants:
        if not _FILE.match(v.file):
            raise BundleError(f"{model_dir / MANIFEST}: variant file {v.file!r} is not a plain "
                              "file name in the model directory")
    # every file the manifest hashes that is carried (variants, eval images, side files) is
    # checked before signing, as the devices will check it (_check_manifest)
    for where, file, sha in hashed:
        if file in names and file_sha256(model_dir / file) != sha:
            raise BundleError(f"{model_dir / file}: sha256 does not match the manifest "
                              f"({where}): refusing to sign a corrupt model directory")
    files = [{"name": n, "size": (model_dir / n).stat().st_size,
              "sha256": file_sha256(model_dir / n)} for n in dict.fromkeys(names)]
    version = check_version(version or files[0]["sha256"][:12])
    check_name(manifest.name)  # a name no device would accept is never signed
    header = {"schema": SCHEMA, "name": manifest.name, "version": version,
              "created": time.time(), "files": files}
    raw = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    sig = json.dumps({"key_id": key_id(key.public_key()),
                      "sig": base64.b64encode(key.sign(raw)).decode()}).encode()
    out = Path(out)
    tmp = out.with_name(f".{out.name}.tmp")
    with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
        _add_bytes(tar, HEADER, raw)
        _add_bytes(tar, SIG, sig)
        for f in files:
            info = tar.gettarinfo(str(model_dir / f["name"]), arcname=f["name"])
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mode = 0o644
            with (model_dir / f["name"]).open("rb") as fh:
                tar.addfile(info, fh)
    os.replace(tmp, out)
    return BundleInfo(manifest.name, version, key_id(key.public_key()), tuple(files),
                      header["created"])


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    import io

    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), 0o644, int(time.time())
    tar.addfile(info, io.BytesIO(data))


def _read_member(tar: tarfile.TarFile, expect: str, path: Path) -> bytes:
    m = tar.next()
    if m is None:
        raise BundleError(f"{path}: truncated: ends before {expect}")
    if m.name != expect:
        if expect == SIG and m.name == MANIFEST:
            raise BundleError(f"{path}: unsigned: the bundle has no {SIG}")
        raise BundleError(f"{path}: not an edgerun bundle: expected {expect} at this point, "
                          f"found {m.name[:100]!r}")
    if not m.isreg() or m.size > MAX_HEADER:
        raise BundleError(f"{path}: {expect} is not a regular file of at most {MAX_HEADER} "
                          "bytes")
    f = tar.extractfile(m)
    assert f is not None
    data = f.read()
    if len(data) != m.size:
        raise BundleError(f"{path}: truncated inside {expect}")
    return data


def _header(raw: bytes, sig_raw: bytes, trusted: Mapping[str, Ed25519PublicKey],
            path: Path) -> BundleInfo:
    """The verified header; BundleError saying why not."""
    try:
        sig = json.loads(sig_raw)
        kid, sig_b64 = sig["key_id"], sig["sig"]
        if not isinstance(kid, str) or not isinstance(sig_b64, str):
            raise TypeError("key_id and sig must be strings")
    except (ValueError, KeyError, TypeError, RecursionError) as e:  # deep `[[[`: Recursion
        raise BundleError(f"{path}: unsigned: {SIG} is not a signature ({e})") from None
    public = trusted.get(kid)
    if public is None:
        raise BundleError(f"{path}: signed by key {kid[:32]!r}, which is not one of the "
                          f"publisher keys this device trusts ([models] publisher_keys: "
                          f"{', '.join(sorted(trusted)) or 'none configured'})")
    try:
        public.verify(base64.b64decode(sig_b64, validate=True), raw)
    except (InvalidSignature, ValueError):
        raise BundleError(f"{path}: bad signature: the header was altered after signing or "
                          f"signed with another key than {kid}") from None
    try:  # signed, so from a trusted publisher; still checked, a publisher can have bugs
        h = json.loads(raw)
        if h.get("schema") != SCHEMA:
            raise ValueError(f"schema {h.get('schema')!r}, expected {SCHEMA!r}")
        files = tuple({"name": str(f["name"]), "size": int(f["size"]),
                       "sha256": str(f["sha256"])} for f in h["files"])
        if not files or files[0]["name"] != MANIFEST:
            raise ValueError(f"the first file must be {MANIFEST}")
        names = [f["name"] for f in files]
        if len(set(names)) != len(names) or not all(_FILE.match(n) for n in names) \
                or any(n in (HEADER, SIG) for n in names):
            raise ValueError("file names must be unique plain names")
        if any(f["size"] < 0 for f in files):
            raise ValueError("negative size")
        model_id(h["name"], h["version"])
        return BundleInfo(h["name"], h["version"], kid, files,
                          float(h.get("created", 0)))
    except (ValueError, KeyError, TypeError, RecursionError, BundleError) as e:
        raise BundleError(f"{path}: signed header is malformed: {e}") from None


def read_info(path: str | Path, trusted: Mapping[str, Ed25519PublicKey]) -> BundleInfo:
    """The verified header of a bundle without unpacking it (files are not checked)."""
    path = Path(path)
    try:
        with tarfile.open(path, "r:") as tar:
            raw = _read_member(tar, HEADER, path)
            return _header(raw, _read_member(tar, SIG, path), trusted, path)
    except (tarfile.TarError, EOFError, OSError) as e:
        raise BundleError(f"{path}: truncated or not a bundle: {e}") from None


def unpack(path: str | Path, dest: str | Path, trusted: Mapping[str, Ed25519PublicKey],
           max_bytes: int = 0, step: Callable[[str], None] | None = None) -> BundleInfo:
    """Verify the bundle at `path` and write its files into the new directory `dest` (which
    must not exist), each checked against the signed list while it streams, then the manifest
    against the list. On any refusal `dest` is removed and BundleError says why. `max_bytes`
    (0 = no cap) bounds what the header may declare; `step("file")` is called after each file
    (the crash-test hook). Files are fsynced: the caller renames `dest` into place."""
    path, dest = Path(path), Path(dest)
    dest.mkdir(parents=True)
    try:
        info = _unpack(path, dest, trusted, max_bytes, step)
        _check_manifest(info, dest, path)
        fsync_dir(dest)
        return info
    except BaseException:
        shutil.rmtree(dest, ignore_errors=True)
        raise


def _unpack(path: Path, dest: Path, trusted: Mapping[str, Ed25519PublicKey], max_bytes: int,
            step: Callable[[str], None] | None) -> BundleInfo:
    try:
        with tarfile.open(path, "r:") as tar:
            info = _header(_read_member(tar, HEADER, path), _read_member(tar, SIG, path),
                           trusted, path)
            if max_bytes and info.size > max_bytes:
                raise BundleError(f"{path}: declares {info.size} bytes of files, over the cap "
                                  f"of {max_bytes} ([models] max_bundle_mb)")
            want = {f["name"]: f for f in info.files}
            seen: set[str] = set()
            # tar.next(), not iteration: iterating a TarFile restarts from its first member
            while (m := tar.next()) is not None:
                f = want.get(m.name)
                if f is None or m.name in seen:
                    raise BundleError(f"{path}: carries {m.name[:100]!r}, which the signed "
                                      "header does not list (or lists once)")
                if not m.isreg():
                    raise BundleError(f"{path}: {m.name} is not a regular file")
                if m.size != f["size"]:
                    raise BundleError(f"{path}: {m.name} is {m.size} bytes, the signed header "
                                      f"says {f['size']}: tampered")
                src = tar.extractfile(m)
                assert src is not None
                digest = _copy(src, dest / m.name, m.size)
                if digest != f["sha256"]:
                    raise BundleError(f"{path}: {m.name}: sha256 {digest[:16]}... does not "
                                      f"match the signed {f['sha256'][:16]}...: tampered or "
                                      "corrupt")
                seen.add(m.name)
                if step:
                    step(m.name)
    except (tarfile.TarError, EOFError) as e:
        raise BundleError(f"{path}: truncated or corrupt: {e}") from None
    if missing := [n for n in want if n not in seen]:
        raise BundleError(f"{path}: truncated: missing {', '.join(missing)}")
    return info


def _copy(src: IO[bytes], to: Path, size: int) -> str:
    h = hashlib.sha256()
    done = 0
    with to.open("xb") as out:
        while chunk := src.read(CHUNK):
            h.update(chunk)
            out.write(chunk)
            done += len(chunk)
        out.flush()
        os.fsync(out.fileno())
    if done != size:
        raise BundleError(f"{to.name}: truncated: {done} of {size} bytes")
    return h.hexdigest()


def _check_manifest(info: BundleInfo, dest: Path, path: Path) -> None:
    """The manifest (already hash-checked) names the bundle's model, and every file it names
    with a hash (variants, eval images, side files: manifest.hashed_files) is in the signed
    list with that hash: a signature covers what is served and what it is measured on. (Eval
    images were not checked: a bundle whose eval.npz differed from the manifest's sha256,
    re-signed over the new bytes, verified and deployed.)"""
    try:
        manifest = load_manifest(dest)
        named = hashed_files(dest)
    except ModelError as e:
        raise BundleError(f"{path}: {e}") from None
    if manifest.name != info.name:
        raise BundleError(f"{path}: the header names model {info.name!r}, the manifest "
                          f"{manifest.name!r}")
    listed = {f["name"]: f["sha256"] for f in info.files}
    variants = {v.file for v in manifest.variants}
    for where, file, sha in named:
        if file not in listed:
            if file not in variants:
                # an eval set left out (`make` packs only those present): the device has no
                # images to measure an engine's own precision on, so it does not use one
                continue
            raise BundleError(f"{path}: manifest {where} names {file[:100]!r}, which the "
                              "bundle does not carry")
        if listed[file] != sha:
            raise BundleError(f"{path}: manifest {where}: {file} has sha256 "
                              f"{listed[file][:16]}..., the manifest says {sha[:16]}...: "
                              "tampered or not the files the manifest was made with")


__all__ = ["BundleError", "BundleInfo", "check_name", "check_version", "inside", "make",
           "model_id", "parse_id", "read_info", "unpack"]
