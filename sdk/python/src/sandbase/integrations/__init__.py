"""SandBase inside agent frameworks: each module is a thin layer over `sandbase.Sandbox`,
installed with the framework as an extra (`pip install 'sandbase[mini-swe-agent]'`)."""
