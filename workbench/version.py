"""The workbench's version: part of every build's identity (a new version builds anew)."""

VERSION = "0.1.0"
