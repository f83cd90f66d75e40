"""Uploading an app: read the bundle, check every file and the code, build the package
environments, store the version."""
