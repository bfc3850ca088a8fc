"""The policies shipped with pyspark-cq, packaged and registered exactly as a third-party plugin would be.

They live in ``plugins/`` (installed as the top-level package ``pyspark_cq_plugins``) and are registered
under the entry-point group ``pyspark_cq.policies`` in ``pyproject.toml``:

==========  ========================================  ===============================================
name        class                                     what
==========  ========================================  ===============================================
``pipes``   `pipes_rm.PipesResourceManager`           PIPES resource manager (Cammert et al., §4):
                                                      window / granularity adjustment by the
                                                      bisection strategy, admission control
==========  ========================================  ===============================================

Nothing here is imported by ``pyspark_cq`` itself; the registry loads a plugin on first use.
"""

# The policies are loaded through their entry points (or `import pyspark_cq_plugins.pipes_rm`).
__all__: list[str] = []
