// herald-apns-bench entry point (to be written).
