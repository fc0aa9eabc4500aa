"""``dkernel info STORE|MODEL``: describe a dataset store or a model file."""

from __future__ import annotations

import argparse
import json
import os


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("info", help="describe a dataset store or a model file")
    p.add_argument("path")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if os.path.isfile(args.path):
        from dkernel.io import read_npz

        arrays, meta = read_npz(args.path)
        info = {"kind": meta.get("kind"), "estimator": meta.get("estimator"),
                "params": meta.get("params"), "versions": meta.get("versions"),
                "arrays": {k: [list(v.shape), str(v.dtype)] for k, v in arrays.items()}}
        info.update({k: v for k, v in meta.items() if k not in info and k not in ("format", "format_version")})
    else:
        from dkernel.data import open_dataset

        data = open_dataset(args.path)
        info = {"kind": "dataset", "path": args.path, "n_rows": data.n_rows, "n_inputs": data.n_inputs,
                "X_dtype": str(data.X.dtype), "n_chunks": data.n_chunks,
                "chunk_rows": int(data.row_chunks[0]),
                "y": None if data.y is None else {"shape": list(data.y.shape), "dtype": str(data.y.dtype)}}
    if args.json:
        print(json.dumps(info, indent=2, default=str))
    else:
        for k, v in info.items():
            print(f"{k}: {json.dumps(v, default=str) if isinstance(v, (dict, list)) else v}")
    return 0
