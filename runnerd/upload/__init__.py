"""Uploading an app: read its folder (walk), check each tool file (tool_file) and the whole
bundle with its code (bundle, code, pins, yamlfile), and build the package environments its
tools need (deploy). Storing the version is the store's."""
