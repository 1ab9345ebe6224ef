"""The zoo's built-in variant plugins, one module each, installed as the package ``zoo_builtins``.

They are loaded exactly like third-party plugins: each module implements ``zoo_register_variants``.
"""
