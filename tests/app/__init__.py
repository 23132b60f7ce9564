"""App tests: Streamlit AppTest and the Playwright browser walk."""
