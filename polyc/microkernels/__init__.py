"""Fixed-shape microkernels (C, one file each) with their registry, matcher and codegen."""
