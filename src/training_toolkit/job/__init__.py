"""What one job is, computed once: the spec read from ``/opt/ml`` (``spec``), the plan of how this host takes
part (``plan``), an attempt's value (``attempt``), the environment a script is given (``contract``), the
user's code (``code``), the verdict's report (``report``) and the MPI options of the hyperparameters.
"""
