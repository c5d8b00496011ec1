"""Renderers: a library result in, human output on a rich console out. No command logic."""
