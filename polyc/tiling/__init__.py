"""Tiling: legal tiling of permutable bands, tile sizes from the target's memory model."""
