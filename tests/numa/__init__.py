"""Tests of launcher.numa: sysfs topology and NUMA affinity strategies."""
