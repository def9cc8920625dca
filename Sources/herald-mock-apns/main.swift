// herald-mock-apns entry point (to be written).
