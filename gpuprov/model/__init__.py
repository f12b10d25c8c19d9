"""Model: one model of a host: its declaration (``gpuprov_host``, ``gpuprov_layouts``), validated
at the input boundary (gpuprov.inputs.declaration), resolved against its facts (``resolve``); the
old variables and NVIDIA's layout files read into it (``legacy``, ``formats``) and written in the
new form (``convert``)."""
