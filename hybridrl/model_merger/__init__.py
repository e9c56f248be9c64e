"""Checkpoint converters: `python -m hybridrl.model_merger merge ...` and `hybridrl convert ...`.

Both go through the megatron adapter's single HF<->Megatron weight mapping (adapters/megatron/mapping.py).
"""
