def run(input):
    priority = "high" if input["customer_tier"] == "enterprise" else "normal"
    return {"queue": "billing" if "invoice" in input["subject"].lower() else "support", "priority": priority}
