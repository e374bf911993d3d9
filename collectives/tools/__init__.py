"""Tools around the library: the launcher that starts every world, Perfetto export, pictures."""
