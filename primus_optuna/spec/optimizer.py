"""Names of Megatron-Core's precision-aware optimizer fields (shared by the study file and the Primus importer,
so neither imports the other)."""

OPTIMIZER_DTYPE_FIELDS = ("main_params_dtype", "main_grads_dtype", "exp_avg_dtype", "exp_avg_sq_dtype")
"""The precision-aware optimizer's dtypes (Megatron argument names, fp32 by default)."""
PRECISION_AWARE_FIELDS = ("precision_aware_optimizer", *OPTIMIZER_DTYPE_FIELDS)
