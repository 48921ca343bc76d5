"""HTTP controllers: thin, they parse, call the pipeline or a resource, and shape the response."""
