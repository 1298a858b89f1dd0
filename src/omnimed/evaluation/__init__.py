"""Metrics, evaluation runners and paper-table reports."""
