"""Layer 13, compatibility: other frameworks' semantics for code ported from them (``docs/porting.md``).

``metaroles.compat.metagpt``: MetaGPT's ``Message.role``, dumps, ``Environment`` and ``Team.run``.
Native code never imports this layer.
"""
