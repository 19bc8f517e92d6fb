"""Front ends: models from other formats as polyc subgraphs (DESIGN.md, "Front ends")."""
