"""Tuning profiles as data: the schema (schema.py), the shipped catalogue and a site's own
(catalogue.py, catalogue/*.yaml), and what fixes each finding cause (causes.py, causes.yaml)."""

from controller.profiles.catalogue import SHIPPED_DIR, Entry, ProfileError, load_catalogue, parse_profile
from controller.profiles.causes import CauseEntry, load_cause_map, problems
from controller.profiles.schema import Profile, SettingView

__all__ = [
    "SHIPPED_DIR",
    "CauseEntry",
    "Entry",
    "Profile",
    "ProfileError",
    "SettingView",
    "load_catalogue",
    "load_cause_map",
    "parse_profile",
    "problems",
]
