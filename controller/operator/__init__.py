"""Parts of the Operator service kept out of operator_api.py, one file each, mixed into
OperatorServicer: silences (ack, silence, maintenance) and the recording stream."""
