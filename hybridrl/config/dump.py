"""Regenerate configs/ppo_trainer.yaml from the schema: `python -m hybridrl.config.dump [OUT]`."""
import os
import sys

from .loader import CONFIG_DIR, defaults_yaml

if __name__ == "__main__":
    if len(sys.argv) > 2 or (len(sys.argv) == 2 and sys.argv[1].startswith("-")):
        # an option is no file name: `--help` once wrote the defaults to a file called --help
        print(__doc__)
        sys.exit(0 if sys.argv[1:] in (["-h"], ["--help"]) else 2)
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(CONFIG_DIR, "ppo_trainer.yaml")
    with open(out, "w") as f:
        f.write(defaults_yaml())
    print(f"wrote {out}")
