"""Per-operator GPU profiles: imported from public measurements, evaluated per engine step.

``source`` reads a profile in LLMServingSim's layout, ``source_v0`` its older per-layer layout,
``importer`` picks between them, ``store`` writes and reads Narwhal's own
format (and lists the bundled ones), ``tables`` interpolates measured tables, ``opstep`` turns a
profile into an engine's step time, ``gpus`` names the devices the bundled profiles cover.
"""
