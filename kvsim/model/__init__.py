"""What a deployment is: model shapes and families, GPU datasheets, engine arguments, weights, the KV layout,
closed-form capacity, MoE and collective costs; and the vocabulary every layer shares (units, the error type,
the version). The bottom layer: it imports no other kvsim package."""
