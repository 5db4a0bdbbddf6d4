"""What the device and the coordinator share: payloads, commands, MQTT, the broker."""
