# Python imports this at start-up in every process whose PYTHONPATH holds this folder (rows.py puts it first for
# verl only): the driver, Ray's workers and vLLM's engine processes get the same shims.
import peer_verl_shims

peer_verl_shims.install()
