"""The real BMC source: Redfish through DMTF's redfish library (session, readers, settings)."""
