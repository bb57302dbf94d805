"""native_engine"""
