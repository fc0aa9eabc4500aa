"""``dkernel plot MODEL --out fig.png``: draw a model's learning curve and spectrum."""

from __future__ import annotations

import argparse

from dkernel.cli.common import add_command, add_output_args, check_output, status


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "plot", "draw a model's learning curve and spectrum to an image",
                    "Draw the per-epoch training history of a model file (loss or objective, "
                    "validation score with early stopping) and, where the model has one, its "
                    "spectrum (EigenPro's preconditioner eigenvalues with q marked, explained "
                    "variance, canonical correlations). Needs matplotlib: "
                    "pip install 'dkernel[plot]'.")
    p.add_argument("model", help="model file written by 'dkernel fit' (.npz)")
    p.add_argument("--out", required=True, metavar="IMAGE",
                   help="image file to write; the extension picks the format (.png, .svg, .pdf)")
    p.add_argument("--dpi", type=int, default=100, help="resolution of raster images")
    add_output_args(p, json_output=False, overwrite=True)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from dkernel.plot import check_image_path, plot_model

    check_image_path(args.out, "--out")  # before the existence check, which needs the real name
    check_output(args.out, args.overwrite)
    plot_model(args.model, args.out, dpi=args.dpi)
    status(args, f"wrote {args.out}")
    return 0
