"""Runners: one module each, sharing the supervision and cluster mechanics outside them."""
