"""Circuits: attribution graphs over transcoder features, and the one page that draws any graph."""
