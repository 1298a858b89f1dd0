"""Lightning modules, data modules, strategies and export; knows no paper."""
