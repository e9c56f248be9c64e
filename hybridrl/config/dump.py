"""Regenerate configs/ppo_trainer.yaml from the schema: `python -m hybridrl.config.dump [OUT]`."""
import os
import sys

from .loader import CONFIG_DIR, defaults_yaml

if __name__ == "__main__":
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(CONFIG_DIR, "ppo_trainer.yaml")
    with open(out, "w") as f:
        f.write(defaults_yaml())
    print(f"wrote {out}")
