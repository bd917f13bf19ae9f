"""What every serving-style run shares, cbserve's and its peers': the requests (ShareGPT or
random, and when each is sent), the client that sends them and times every token, the
statistics as vLLM's benchmark defines them, and the report (a table, JSON, plots)."""
