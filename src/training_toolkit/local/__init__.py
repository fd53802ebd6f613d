"""Several training hosts on one machine, so multi-host jobs can be tested without a fleet."""
