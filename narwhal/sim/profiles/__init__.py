"""Per-operator GPU profiles: imported from public measurements, evaluated per engine step.

``source`` reads a profile in LLMServingSim's layout, ``store`` writes and reads Narwhal's own
format (and lists the bundled ones), ``tables`` interpolates measured tables, ``opstep`` turns a
profile into an engine's step time, ``gpus`` names the devices the bundled profiles cover.
"""
