"""One run of a tool, without governance: the pipeline, the jail, package environments,
runtimes, cgroups and secret scrubbing."""
