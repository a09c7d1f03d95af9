"""Learned sparse retrievers (SPLADE, BGE-M3's lexical weights): one weight per vocabulary id, scored by dot product."""
