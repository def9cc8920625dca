// herald-bench entry point (to be written).
