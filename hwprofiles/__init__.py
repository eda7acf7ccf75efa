"""Hardware profiles as data: one YAML file per device (schema and loader in ``costmodel.hardware``)."""
