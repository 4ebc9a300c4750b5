"""Transport security of the controller: TLS credentials that follow rotated files (tls.py), the node
identity a stream's client certificate proves (identity.py), and the one-line warning operators see
when the controller runs weakened (warning.py)."""
