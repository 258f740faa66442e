"""`nas train-supernet [out=DIR] [overrides]`: train the space's weight-sharing supernet.

Overrides are Hydra's, with the `supernet` group (conf/supernet/default.yaml):
`space=nb201 data=fashion_mnist supernet.epochs=1 supernet.train_subset=2000 out=runs/sn`.
Writes DIR/supernet.pt and DIR/supernet.json (sha256 + metadata); search with it:
`nas search space=nb201 evaluator=supernet evaluator.checkpoint=DIR/supernet.pt data=...`.
"""

from __future__ import annotations

from pathlib import Path

from nas.cli.main import check_group_overrides, fail
from nas.config import check_config, data_source, split_override
from nas.errors import NasError
from nas.lazy import LazyImport
from nas.status import status
from supernets.settings import SupernetSettings

supernet_training = LazyImport("supernets.train")  # torch and Lightning (~10 s): after the config is checked

USAGE = "usage: nas train-supernet space=NAME [data=...] [supernet.KEY=...] [seed=N] [out=DIR]"


def main(argv: list[str]) -> None:
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__.strip() + "\n\n" + USAGE)
        raise SystemExit(0)
    outs, rest = split_override(argv, "out")
    check_group_overrides(rest)
    try:
        cfg = check_config(rest)  # a bad override or setting fails before the slow imports
        progress = bool(cfg.get("progress", True))
        group = dict(cfg["supernet"])
        out = Path(outs[-1] if outs else group.pop("out"))
        group.pop("out", None)
        params = group.pop("params", None) or {}
        settings = SupernetSettings.from_dict(group)
        with status("loading torch and Lightning", show=progress):  # ~10 s on a CPU, Lightning's torchmetrics most
            train_supernet = supernet_training.train_supernet  # the import happens here

        result = train_supernet(cfg["space"], params, data_source(cfg["data"]), settings, int(cfg["seed"]), out,
                                progress=progress)
    except NasError as err:
        fail(str(err))
    print(f"supernet: {result.path} sha256 {result.sha256[:16]}; valid accuracy largest "
          f"{result.val_accuracy_largest:.2f}%, smallest {result.val_accuracy_smallest:.2f}%; "
          f"{result.steps} steps, {result.wall_seconds:.1f} s")
