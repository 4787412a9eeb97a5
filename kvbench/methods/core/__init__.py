"""What every backend's implementation of a method is made of: the Codec and LayerCachePolicy
contracts, the Implementation a method's settings become, and the layer caches written once over
the array seam (kvbench.backends.arrays), so torch and MLX store, pack and count the same
tokens by the same code."""
