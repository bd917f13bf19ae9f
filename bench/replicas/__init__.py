"""`cbserve bench replicas`: cbserve replicas behind SGLang's model gateway (issue 33)."""
