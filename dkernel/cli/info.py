"""``dkernel info PATH``: describe a dataset store, a prediction store, a model
or a checkpoint file -- anything dkernel writes."""

from __future__ import annotations

import argparse
import os
from typing import Any

from dkernel.cli.common import add_command, add_output_args, emit


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "info", "describe a dataset store, prediction store, model or checkpoint",
                    "Describe what dkernel wrote at PATH: a dataset store (rows, inputs, chunks, "
                    "y), a prediction / projection store (its arrays), a model file (estimator, "
                    "parameters, arrays, training history) or a checkpoint.")
    p.add_argument("path",
                   help="zarr store (local path or fsspec URL) or .npz model / checkpoint file")
    add_output_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if "://" not in args.path and not os.path.exists(args.path):
        # ("no dataset store at 'model.npz'" for a model file's path)
        raise FileNotFoundError(f"{args.path!r} does not exist: dkernel info reads a dataset or "
                                "prediction store, a model file or a checkpoint; check the path")
    info = _file_info(args.path) if os.path.isfile(args.path) else _store_info(args.path)
    if args.json:
        emit(args, info)
        return 0
    history = info.pop("history", None)
    emit(args, info)
    if history:
        last = {k: v for k, v in history[-1].items() if k != "epoch"}
        emit(args, {"history": f"{len(history)} epoch(s); last: {_short(last)}"})
    return 0


def _short(entry: dict) -> str:
    return ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
                     for k, v in entry.items())


def _file_info(path: str) -> dict[str, Any]:
    from dkernel.files import read_npz_meta, read_npz_shapes

    meta = read_npz_meta(path)
    info = {"kind": meta.get("kind"), "path": path, "estimator": meta.get("estimator"),
            "params": meta.get("params"), "versions": meta.get("versions"),
            "arrays": {k: [list(shape), dtype]
                       for k, (shape, dtype) in read_npz_shapes(path).items()}}
    info.update({k: v for k, v in meta.items()
                 if k not in info and k not in ("format", "format_version")})
    return {k: v for k, v in info.items() if v is not None}


def _store_info(path: str) -> dict[str, Any]:
    from dkernel.data.dataset import _open_zarr_group

    if os.path.isdir(path) and not _is_zarr(path):
        # a folder of stores, as 'dkernel ingest fashion-mnist' or 'dkernel demo' write
        stores = sorted(n for n in os.listdir(path) if _is_zarr(os.path.join(path, n)))
        if stores:
            return {"kind": "folder", "path": path,
                    "stores": {n: _store_info(os.path.join(path, n)) for n in stores}}

    group = _open_zarr_group(path, None)
    names = sorted(group.array_keys())
    arrays = {k: {"shape": list(group[k].shape), "dtype": str(group[k].dtype),
                  "chunk_rows": int(group[k].chunks[0]) if group[k].ndim else None}
              for k in names}
    attrs = dict(group.attrs)
    if "X" in names:
        from dkernel.data import open_dataset

        data = open_dataset(path)
        info: dict[str, Any] = {
            "kind": "dataset", "path": path, "n_rows": data.n_rows, "n_inputs": data.n_inputs,
            "X_dtype": str(data.X.dtype), "n_chunks": data.n_chunks,
            "chunk_rows": int(data.row_chunks[0]),
            "y": None if data.y is None else {"shape": list(data.y.shape),
                                              "dtype": str(data.y.dtype)}}
        if os.path.isdir(path):  # chunks zarr would read as fill values (check_chunks_present)
            from dkernel.data.dataset import chunk_files

            counts = {k: chunk_files(group[k], os.path.join(path, k)) for k in names}
            missing = {k: total - have for k, (total, have) in counts.items() if have < total}
            if missing:
                info["chunks_not_stored"] = missing
    elif names:
        kind = {"predict": "predictions", "transform": "projections"}.get(
            attrs.get("dkernel"),
            "predictions" if "y_pred" in names else "projections" if "Z" in names else "zarr store",
        )
        first = group[names[0]]
        info = {"kind": kind, "path": path,
                "n_rows": int(first.shape[0]) if first.ndim else None, "arrays": arrays}
    else:
        groups = sorted(name for name, _ in group.groups())
        if groups:
            raise ValueError(f"{path!r} holds groups, not arrays ({', '.join(groups[:5])}); "
                             f"describe one: dkernel info {path.rstrip('/')}/{groups[0]}")
        raise ValueError(f"{path!r} is an empty zarr group: no arrays to describe")
    if attrs:
        info["attrs"] = attrs
    return info


def _is_zarr(path: str) -> bool:
    return any(os.path.exists(os.path.join(path, f)) for f in ("zarr.json", ".zgroup", ".zarray"))
