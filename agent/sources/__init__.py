"""Hardware sources.

Only modules here import pynvml, redfish or psutil; each has a real and a simulated form.
"""
