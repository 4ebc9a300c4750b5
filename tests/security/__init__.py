"""Tests of issue 15: transport security, credentials and hostile input."""
